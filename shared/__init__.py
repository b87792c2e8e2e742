"""Code every service imports: settings, the bus, storage, the canonical sample, telemetry.

Importing it puts the finder for compiled hot modules (shared.accel) in place first, so a
service's modules, its worker processes' and the tests' use the build when it is current."""

from shared import accel

accel.install()
