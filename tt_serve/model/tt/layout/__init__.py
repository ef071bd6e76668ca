"""Checkpoint -> device layouts in numpy only (no device): the declared device-weight table, its
transforms, host weights and tensor parallel placement. The layout names (``TILE``,
``ROW_MAJOR``) are declared here; ``ops/`` maps them onto ttnn's."""

TILE = "tile"
ROW_MAJOR = "row_major"
