"""Hand transcriptions of real engines' decisions, each rule cited to the engine's source lines."""
