// trainer sources go here
