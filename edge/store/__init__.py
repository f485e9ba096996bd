"""Files that must survive a crash: durable writes (durable), the one versioned-folder switch (versions), an
artifact's names on it (layout), artifact sets (artifact), and whole-or-nothing writes (fileio)."""
