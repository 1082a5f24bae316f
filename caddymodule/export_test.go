package caddymodule

// EngineReferences is how many configs hold the engine of storage
// directory dir (for tests of reloads).
func EngineReferences(dir string) int {
	n, _ := engines.References(dir)
	return n
}
