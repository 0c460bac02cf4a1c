"""ALFWorld household text games: official data when available, offline-generated games otherwise."""
