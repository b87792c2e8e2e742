"""Developer tooling, out of the kernel's import path: the local stack and its supervisor
(`tuneloop up`), the `tuneloop` command, base-model preparation, the demo and the generated
reference docs. No service imports anything here; tests, the Makefile and the CLI do."""
