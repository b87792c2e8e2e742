"""`python -m shared.dev.cli`, as the `tuneloop` script."""

from shared.dev.cli import main

main()
