"""Checkpoint -> device layouts in numpy only (no device): host weights and tensor parallel placement."""
