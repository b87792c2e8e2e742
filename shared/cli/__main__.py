"""`python -m shared.cli`, as the `tuneloop` script."""

from shared.cli import main

main()
