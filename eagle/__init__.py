"""EAGLE-2 Explorer: an EAGLE-2 speculative decoder that records every draft tree it builds."""
