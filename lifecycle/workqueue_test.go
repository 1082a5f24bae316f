package lifecycle

import "testing"

// TestWorkQueue: an id is queued once however often it is added, and an id
// added while it is processed is queued again after done.
func TestWorkQueue(t *testing.T) {
	q := newWorkQueue()
	q.add("a")
	q.add("b")
	q.add("a") // queued already
	if n := q.len(); n != 2 {
		t.Fatalf("len %d, want 2", n)
	}
	id, _ := q.get()
	if id != "a" {
		t.Fatalf("got %q, want a", id)
	}
	q.add("a") // while processing: queued again after done, not before
	if n := q.len(); n != 1 {
		t.Fatalf("len %d while a is processed, want 1 (b)", n)
	}
	q.done("a")
	if id, _ := q.get(); id != "b" {
		t.Fatalf("got %q, want b", id)
	}
	if id, _ := q.get(); id != "a" {
		t.Fatalf("got %q, want a again", id)
	}
	done := make(chan bool)
	go func() {
		_, ok := q.get()
		done <- ok
	}()
	q.close()
	if <-done {
		t.Fatal("get after close returned an id")
	}
	q.add("c")
	if n := q.len(); n != 0 {
		t.Fatalf("add after close queued %d", n)
	}
}
