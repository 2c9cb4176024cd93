//go:build !race

package hbone

// raceEnabled: the race detector is on; it makes stacks larger.
const raceEnabled = false
