"""Measuring a draft: acceptance and speedup over a prompt set (`evaluate_acceptance`), the cost ratios c and v, the
results' keys and the eval JSON, the tables."""
