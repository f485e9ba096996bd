"""Files that must survive a crash: durable renames, the versioned-folder switch (versions), artifact sets, and
whole-or-nothing writes (fileio)."""
