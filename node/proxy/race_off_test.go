//go:build !race

package proxy

// raceEnabled: the race detector is on; it makes stacks larger.
const raceEnabled = false
