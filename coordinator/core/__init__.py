"""Pure coordinator core: events in, commands out. No IO, no clocks, no global randomness."""
