// Placeholder source for an area that has only headers so far.
