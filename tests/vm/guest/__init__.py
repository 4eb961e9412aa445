"""Guest side of the VM tier: runs only inside the VM (PLEXUS_IN_VM=1)."""
