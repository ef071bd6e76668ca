"""Checkpoint -> device layouts in numpy only (no device): the declared device-weight table, its
transforms, host weights and tensor parallel placement."""
