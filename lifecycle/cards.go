package lifecycle

import (
	"maps"
	"sync"
)

// This file keeps each sandbox's link card: the tags of its app's last
// top-level HTML page per port (title, description, og:*, twitter:*),
// which the preview path serves to unfurl bots while the sandbox sleeps.
// A changed card waits in memory and is written with the next activity
// flush (no store write on the request path); it is kept in the record.

// Card is a page's link-preview tags.
type Card struct {
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	// Meta are the og:* and twitter:* tags, in page order, name then
	// content.
	Meta [][2]string `json:"meta,omitempty"`
}

// Bounds of a card: what a link preview shows, not a page's worth.
const (
	MaxCardMeta  = 32
	MaxCardValue = 1024
)

// Equal reports whether c and o hold the same tags.
func (c Card) Equal(o Card) bool {
	if c.Title != o.Title || c.Description != o.Description || len(c.Meta) != len(o.Meta) {
		return false
	}
	for i := range c.Meta {
		if c.Meta[i] != o.Meta[i] {
			return false
		}
	}
	return true
}

// cards are the cards not yet written, and the last card each sandbox's
// port showed: a page load whose card did not change costs a comparison,
// not a store read.
type cards struct {
	mu      sync.Mutex
	pending map[string]map[int]Card
	seen    map[string]map[int]Card
}

// SetCard keeps the card of sandbox id's port, written at the next
// activity flush when it changed.
func (m *Manager) SetCard(id string, port int, c Card) {
	m.cards.mu.Lock()
	prev, known := m.cards.seen[id][port]
	m.cards.mu.Unlock()
	if !known {
		// The first page load since this process started: the
		// record's card, read once.
		rec, err := m.store.Get(id)
		if err != nil {
			return // gone
		}
		prev, known = rec.Cards[port]
	}
	changed := !known || !prev.Equal(c)
	m.cards.mu.Lock()
	defer m.cards.mu.Unlock()
	setCard(&m.cards.seen, id, port, c)
	if changed {
		setCard(&m.cards.pending, id, port, c)
	}
}

func setCard(in *map[string]map[int]Card, id string, port int, c Card) {
	if *in == nil {
		*in = map[string]map[int]Card{}
	}
	if (*in)[id] == nil {
		(*in)[id] = map[int]Card{}
	}
	(*in)[id][port] = c
}

// forgetCards drops what is kept of a sandbox whose record went.
func (m *Manager) forgetCards(id string) {
	m.cards.mu.Lock()
	defer m.cards.mu.Unlock()
	delete(m.cards.seen, id)
	delete(m.cards.pending, id)
}

// Card returns the card of sandbox id's port: the last one seen (written
// or waiting for the flush), else the record's.
func (m *Manager) Card(id string, port int) (Card, bool) {
	m.cards.mu.Lock()
	c, ok := m.cards.seen[id][port]
	m.cards.mu.Unlock()
	if ok {
		return c, true
	}
	rec, err := m.store.Get(id)
	if err != nil {
		return Card{}, false
	}
	c, ok = rec.Cards[port]
	return c, ok
}

// takeCards hands the waiting cards to a flush.
func (m *Manager) takeCards() map[string]map[int]Card {
	m.cards.mu.Lock()
	defer m.cards.mu.Unlock()
	p := m.cards.pending
	m.cards.pending = nil
	return p
}

// putBackCards returns cards whose flush failed, unless newer ones came.
func (m *Manager) putBackCards(p map[string]map[int]Card) {
	m.cards.mu.Lock()
	defer m.cards.mu.Unlock()
	if m.cards.pending == nil {
		m.cards.pending = map[string]map[int]Card{}
	}
	for id, byPort := range p {
		if m.cards.pending[id] == nil {
			m.cards.pending[id] = maps.Clone(byPort)
			continue
		}
		for port, c := range byPort {
			if _, newer := m.cards.pending[id][port]; !newer {
				m.cards.pending[id][port] = c
			}
		}
	}
}
