"""Where frames come from: one source for every URI (source), the readers, the deadline batcher and the cameras."""
