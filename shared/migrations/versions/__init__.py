"""Migration scripts, one per schema change; services add theirs here."""
