"""VM tier: tests that need a full kernel, run in one virtme-ng boot."""
