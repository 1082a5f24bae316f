// Command caddy is Caddy with its standard modules and sandwake: what
// `xcaddy build --with github.com/sandwake/sandwake` produces.
package main
