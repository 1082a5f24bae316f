// Package sandwake is the import path operators give xcaddy:
//
//	xcaddy build v2.11.9 --with github.com/sandwake/sandwake
//
// xcaddy's main.go blank-imports each --with path as a package, and a Caddy
// module or command registers only when its package is imported. This package
// therefore imports every sandwake package that registers something (the way
// caddy-l4's root imports.go does for its modules); a new package that calls
// caddy.RegisterModule or caddycmd.RegisterCommand is added here, and
// TestXcaddyBuild lists the registered modules and commands to prove it.
//
// It holds no code of its own and must import nothing that registers nothing.
package sandwake
