"""Eval sets: a tenant's held-out samples, one immutable version per refresh."""
