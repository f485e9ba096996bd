"""Inference backends behind one interface (see base.Backend)."""
