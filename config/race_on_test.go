//go:build race

package config

// raceEnabled: the race detector slows the library path tenfold.
const raceEnabled = true
