"""Deployment: SavedModel export (TF Serving layout and signatures), TFLite
conversion and running, and `predict` over any exported form."""
