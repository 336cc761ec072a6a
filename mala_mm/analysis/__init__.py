"""Measurements of models: FLOP counts (:mod:`.flops`) and what an attention block attends to
(:mod:`.attention_scores`). Import the module you need; ``import mala_mm`` does not load them."""
