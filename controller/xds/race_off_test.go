//go:build !race

package xds_test

// raceBuild: the race detector's allocations inflate heap figures.
const raceBuild = false
