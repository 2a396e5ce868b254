"""The commands that read a study rather than run it: status, verify, prune, predict, and `study eval` of an input file."""
