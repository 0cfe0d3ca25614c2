"""Baseline policies for side-by-side comparison with Gandiva_fair (not the product core)."""
