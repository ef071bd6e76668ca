# The pinned sources (nix/pins.json, SRI sha256). Every fetcher takes its url and hash from
# here; scripts/check-pins verifies the file and that no .nix file carries its own hash.
builtins.fromJSON (builtins.readFile ./pins.json)
