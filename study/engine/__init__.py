"""What runs a grid: Ray Tune dispatch and resume (one trainable for `study run` and `study tune`), a trial's
training and its one evaluation path, the searcher, node loss, logger callbacks, and a failure's root cause."""
