"""Tenants and their keys, made through a running ingest service's admin API."""

from __future__ import annotations

import httpx

# The local stack's admin token (TUNELOOP_ENV=development's default).
ADMIN = {"Authorization": "Bearer tuneloop-dev-admin"}


def tenant_key(url: str, tenant: str = "acme", scope: str = "write") -> str:
    """A new key of `tenant` with `scope`, the tenant created first if it is new."""
    created = httpx.post(
        f"{url}/v1/admin/tenants", json={"id": tenant, "name": tenant}, headers=ADMIN
    )
    assert created.status_code in (201, 409), created.text
    response = httpx.post(
        f"{url}/v1/admin/tenants/{tenant}/api_keys",
        json={"name": "tests", "scope": scope},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["key"])
