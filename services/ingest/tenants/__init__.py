"""Tenant administration: tenants and their API keys."""
