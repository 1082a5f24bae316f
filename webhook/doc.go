// Package webhook signs and verifies sandwake's webhook deliveries. Receivers
// written in Go use Verify on every request:
//
//	body, _ := io.ReadAll(r.Body)
//	if err := webhook.Verify(secret, r.Header.Get(webhook.HeaderSignature), body, 5*time.Minute); err != nil {
//		http.Error(w, err.Error(), http.StatusUnauthorized)
//		return
//	}
//
// A delivery is a POST whose body is one event as JSON, with the headers
// Sandwake-Delivery (the event id: deliveries are at least once, so a receiver
// drops ids it has seen) and Sandwake-Signature: t=<unix seconds>,v1=<hex
// HMAC-SHA256(secret, "<t>.<body>")>.
//
// It imports nothing of sandwake: receivers use it on its own.
package webhook
