"""What a tenant id may look like: one definition for events, samples and API keys.

A tenant id is a NATS subject token (subjects are `tuneloop.<tenant>...`), a path segment and a
database key, so it is a lowercase slug: 1-63 letters, digits, `-` or `_`, starting and ending
with a letter or digit.
"""

import re
from typing import Annotated

from pydantic import StringConstraints

TENANT_PATTERN = r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$"
TENANT_RE = re.compile(TENANT_PATTERN)

TenantId = Annotated[str, StringConstraints(pattern=TENANT_PATTERN)]


def is_tenant_id(value: str) -> bool:
    return TENANT_RE.fullmatch(value) is not None
