// Package docs holds the tests of the Markdown docs: every relative link and
// anchor resolves, every Caddyfile snippet adapts with this build's adapter.
package docs
