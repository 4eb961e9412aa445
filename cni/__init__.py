"""CNI library: spec types and versions, the plugin skeleton and a libcni-style runtime."""
