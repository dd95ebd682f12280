"""The analysis layer: a compiled program or jaxpr in, a plain result out (HLO, dissection, memory, cost)."""
