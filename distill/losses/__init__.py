"""The objectives (used by step 4, distil): the per-token divergences and their table (divergences.py), a recipe's
`distill.loss` as a weighted combination with schedules (loss_mix.py), the batch loss chunked over the vocabulary
projection (distill_loss.py) with its closed-form-gradient path fused with a plain lm_head (fused.py), and the
training-time test of EAGLE-3 heads (head_loss.py). Nothing is imported here."""
