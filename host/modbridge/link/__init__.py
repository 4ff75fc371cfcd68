"""The serial side: a module link (session), port discovery, pairing keys."""
