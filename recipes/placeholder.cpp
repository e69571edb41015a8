// recipe sources
