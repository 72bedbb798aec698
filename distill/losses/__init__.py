"""The objectives (used by step 4, distil): the per-token divergences and their table (divergences.py), a recipe's
`distill.loss` as a weighted combination with schedules (loss_mix.py), the batch loss chunked over the vocabulary
projection (distill_loss.py) with its closed-form-gradient path fused with a plain lm_head (fused.py), and the loss
options they share (options.py). A kind's own training losses live in its folder (kinds/<kind>/loss.py). Nothing is
imported here."""
