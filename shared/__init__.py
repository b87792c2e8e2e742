"""Code every service imports: settings, the bus, storage, the canonical sample, telemetry."""
