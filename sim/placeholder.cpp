// sim sources
