"""The pure scheduling core: cluster snapshot + pending jobs + profile in, decisions out."""
