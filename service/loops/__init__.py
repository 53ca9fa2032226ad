"""Background loops started in the app's lifespan: they make recorded intent happen on Ray."""
