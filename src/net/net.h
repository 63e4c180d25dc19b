// SPDX-License-Identifier: Apache-2.0
//
// net: the event loop, TCP streams, child processes, address parsing and
// reconnect backoff. A thin layer over libuv so that protocol code never
// calls libuv directly (STYLE.md s.3.6): protocol logic is sans-I/O state
// machines (src/proto), and the roles wire those machines to this module.
//
// Threading model (libuv's):
//   - One pcp_loop_t per thread. The thread that calls pcp_loop_run is the
//     loop thread; every function marked "loop thread only" must be called
//     from it (or, while the loop is not running, from the one thread that
//     owns the loop). Every callback of this module runs on the loop thread.
//   - Other threads reach a loop only through pcp_loop_post (a bounded
//     queue with a wake-up) and pcp_loop_stop, which are thread-safe.
//
// The callback contract (libuv's, for every submit call in this header:
// post, timer start, connect, write, shutdown, spawn):
//   - If the submit call returns an error, its callback never runs.
//   - Otherwise the callback runs exactly once, later, on the loop thread,
//     never from inside the submit call. Cancellation (an explicit cancel,
//     closing the handle, releasing the loop) is a completion like any other:
//     the callback runs with CANCELLED.
//   - Handles stay valid until their final callback has returned (timers,
//     connections, processes: named on each type) or until their release
//     call (signal watchers, listeners); after that the pointer must not be
//     used.
//   - Every submit and handle-creating call returns FAILED_PRECONDITION
//     once pcp_loop_release has begun (a close callback that tries to
//     reconnect during shutdown gets an error, not a half-made handle), and
//     INVALID_ARGUMENT for a missing callback.
//
// Ownership: a loop owns every handle made on it. pcp_loop_release cancels
// whatever is still live (each pending callback runs once with CANCELLED)
// and frees it. Caller buffers handed to pcp_tcp_conn_write are borrowed
// until the write's callback (zero copy: a 256 MiB tensor is written from
// the caller's memory). Bytes passed to read callbacks are borrowed for the
// duration of the callback only.
//
// Memory: every allocation of this module goes through the loop's
// pcp_allocator_t (libuv's own small internal allocations aside). Each queue
// is bounded: the post queue by its capacity, each connection's send queue by
// bytes and request count; reads go through one shared 64 KiB buffer per
// loop, so an idle connection costs no read buffer.
//
// Time: timers use libuv's monotonic clock. The deterministic simulator
// replaces this module as a whole rather than its clock.
//
// Address parsing and backoff are pure functions (no loop, no I/O) and are
// thread-safe.

#ifndef PCP_NET_NET_H_
#define PCP_NET_NET_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Addresses
//===----------------------------------------------------------------------===//

// Longest host accepted (DNS names are at most 253 bytes).
#define PCP_NET_MAX_HOST_LENGTH 255
// Longest text pcp_net_address_format can write: "[" host "]:65535" + NUL.
#define PCP_NET_ADDRESS_TEXT_CAPACITY (PCP_NET_MAX_HOST_LENGTH + 10)

// A parsed "host:port". |host| is NUL-terminated, without brackets for IPv6
// literals ("::1"). Plain value, thread-compatible.
typedef struct pcp_net_address_t {
  char host[PCP_NET_MAX_HOST_LENGTH + 1];
  uint16_t port;
} pcp_net_address_t;

// Parses "host:port", "1.2.3.4:80", "[::1]:80" or "[fe80::1%eth0]:80".
// The port is a decimal in [0, 65535] (0 asks listen for an ephemeral port;
// connect rejects it); an IPv6 literal must be bracketed. Returns
// INVALID_ARGUMENT quoting |text| for an empty host, a missing, signed,
// non-decimal or out-of-range port, unbalanced brackets or an over-long
// host. |out_address| is cleared first. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_net_address_parse(pcp_string_view_t text, pcp_net_address_t* out_address);

// True when |host| is an IPv4 or IPv6 literal (no DNS needed). Thread-safe.
bool pcp_net_host_is_literal(const char* host);

// Writes "host:port" ("[host]:port" for IPv6) into |buffer| (always
// NUL-terminated when |capacity| > 0). Returns the length the whole text
// needs, like snprintf. Thread-safe.
size_t pcp_net_address_format(const pcp_net_address_t* address, char* buffer,
                              size_t capacity);

//===----------------------------------------------------------------------===//
// Backoff
//===----------------------------------------------------------------------===//

// Exponential backoff with full jitter: attempt n (0-based) waits a uniform
// random time in [min_ms, min(max_ms, min_ms * multiplier^n)]. Full jitter
// (rather than "equal jitter" or none) spreads a crowd of workers that lost
// the same gateway at the same instant, so they do not reconnect in waves.
typedef struct pcp_backoff_options_t {
  int64_t min_ms;     // >= 0; also the first attempt's ceiling
  int64_t max_ms;     // >= min_ms; the ceiling never exceeds it
  double multiplier;  // >= 1.0 and finite
} pcp_backoff_options_t;

// 100 ms doubling up to 30 s. Thread-safe.
pcp_backoff_options_t pcp_backoff_options_default(void);

// Plain value, thread-compatible.
typedef struct pcp_backoff_t {
  pcp_backoff_options_t options;
  uint32_t attempt;   // delays handed out since the last reset
  double ceiling_ms;  // ceiling of the next delay
} pcp_backoff_t;

// Returns INVALID_ARGUMENT (naming the field) for options out of range;
// |out_backoff| is cleared first. Thread-compatible.
PCP_MUST_USE_RESULT pcp_status_t pcp_backoff_initialize(
    const pcp_backoff_options_t* options, pcp_backoff_t* out_backoff);

// Returns the next delay in ms and advances the attempt count. Draws one
// number from |rng| (the caller's seeded generator, so that a simulated run
// replays exactly). Thread-compatible.
int64_t pcp_backoff_next_ms(pcp_backoff_t* backoff, pcp_rng_t* rng);

// Call on success (connected, child stayed up): the next delay starts again
// from min_ms. Thread-compatible.
void pcp_backoff_reset(pcp_backoff_t* backoff);

//===----------------------------------------------------------------------===//
// pcp_loop_t
//===----------------------------------------------------------------------===//

typedef struct pcp_loop_t pcp_loop_t;

#define PCP_LOOP_DEFAULT_POST_QUEUE_CAPACITY 1024

typedef struct pcp_loop_options_t {
  // Every allocation of the loop and its handles. Must be thread-safe if
  // pcp_loop_post is used from other threads (the queue is preallocated,
  // so in practice posting allocates nothing).
  pcp_allocator_t allocator;
  // Entries in the post queue; 0 means PCP_LOOP_DEFAULT_POST_QUEUE_CAPACITY.
  size_t post_queue_capacity;
} pcp_loop_options_t;

// System allocator, default capacity. Thread-safe.
pcp_loop_options_t pcp_loop_options_default(void);

// Creates a loop. Also sets SIGPIPE to ignored for the process if it is at
// its default (a write to a closed socket must be an EPIPE status, not the
// death of the process). Returns INVALID_ARGUMENT (capacity over 2^24),
// RESOURCE_EXHAUSTED, or the libuv initialization error. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_loop_create(const pcp_loop_options_t* options, pcp_loop_t** out_loop);

// Runs callbacks until pcp_loop_stop is called; the calling thread becomes
// the loop thread for the duration. A stop requested before the call makes
// it return after one pass. May be called again after it returns. Returns
// FAILED_PRECONDITION if the loop is already running.
// Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_loop_run(pcp_loop_t* loop);

// Asks pcp_loop_run to return after the callbacks now running. Thread-safe
// (also callable from a signal watcher's callback or a posted callback).
void pcp_loop_stop(pcp_loop_t* loop);

// Cancels every live handle and queued post (each pending callback runs
// once with CANCELLED, on the calling thread, before this returns), closes
// the loop and frees it. Must not be called while pcp_loop_run is active;
// posting threads must have stopped posting. Loop thread only.
void pcp_loop_release(pcp_loop_t* loop);

// True when called on the thread that is inside pcp_loop_run. Thread-safe.
bool pcp_loop_is_loop_thread(pcp_loop_t* loop);

// The loop's cached monotonic time in ms (updated once per iteration, the
// time base of timers). Loop thread only.
uint64_t pcp_loop_now_ms(pcp_loop_t* loop);

// Allocator the loop was created with (borrowed). Thread-safe.
pcp_allocator_t pcp_loop_allocator(pcp_loop_t* loop);

//===----------------------------------------------------------------------===//
// Posting work to the loop thread
//===----------------------------------------------------------------------===//

// |code| is OK when run by the loop, CANCELLED when the loop was released
// with the entry still queued.
typedef void (*pcp_loop_post_fn_t)(void* user_data, pcp_status_code_t code);

// Queues |fn(user_data)| to run on the loop thread and wakes the loop.
// Callbacks run in the order their posts were accepted. Returns
// RESOURCE_EXHAUSTED when the queue already holds post_queue_capacity
// entries (the caller decides: retry later, drop, or fail its own request)
// and FAILED_PRECONDITION once pcp_loop_release has begun; in both cases
// |fn| never runs. Thread-safe; allocates nothing.
PCP_MUST_USE_RESULT pcp_status_t pcp_loop_post(pcp_loop_t* loop,
                                               pcp_loop_post_fn_t fn,
                                               void* user_data);

// Entries queued now (a snapshot, for metrics). Thread-safe.
size_t pcp_loop_post_queue_length(pcp_loop_t* loop);

//===----------------------------------------------------------------------===//
// Timers
//===----------------------------------------------------------------------===//

typedef struct pcp_loop_timer_t pcp_loop_timer_t;

// |code| is OK when the timer expired, CANCELLED when it was cancelled or
// the loop released.
typedef void (*pcp_loop_timer_fn_t)(void* user_data, pcp_loop_timer_t* timer,
                                    pcp_status_code_t code);

// Starts a timer that expires after |timeout_ms| and then, if |repeat_ms| >
// 0, every |repeat_ms|. Timers due at the same time fire in start order.
//   - One-shot (|repeat_ms| == 0): |fn| runs exactly once, OK at expiry or
//     CANCELLED; that call is the final one.
//   - Repeating: |fn| runs with OK at each expiry and finally once with
//     CANCELLED after pcp_loop_timer_cancel (or loop release).
// |*out_timer| (may be NULL when never cancelled) is valid until the final
// callback has returned. Returns RESOURCE_EXHAUSTED; on error |fn| never
// runs. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_loop_timer_start(
    pcp_loop_t* loop, uint64_t timeout_ms, uint64_t repeat_ms,
    pcp_loop_timer_fn_t fn, void* user_data, pcp_loop_timer_t** out_timer);

// Cancels |timer|: it will not expire again, and its callback runs once with
// CANCELLED on a later loop iteration (never inside this call). Idempotent
// until the final callback; calling it from the timer's own OK callback is
// fine. Loop thread only.
void pcp_loop_timer_cancel(pcp_loop_timer_t* timer);

// Re-arms |timer| to expire |timeout_ms| from now, keeping its repeat
// period: a peer's silence deadline pushed back on every heartbeat, with no
// completion per push (the start's single final callback is still owed).
// Fine from the timer's own callback when repeating. Returns
// FAILED_PRECONDITION once the timer was cancelled or a one-shot timer
// expired. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_loop_timer_restart(pcp_loop_timer_t* timer,
                                                        uint64_t timeout_ms);

//===----------------------------------------------------------------------===//
// Signals
//===----------------------------------------------------------------------===//

typedef struct pcp_loop_signal_t pcp_loop_signal_t;

// Runs on the loop thread for each delivery of |signum| (coalesced when
// deliveries arrive faster than the loop turns).
typedef void (*pcp_loop_signal_fn_t)(void* user_data, int signum);

// Watches |signum| (SIGTERM, SIGINT, SIGHUP ...) for graceful shutdown.
// While any watcher exists for a signal, its default action (terminate) is
// replaced by the callback. Returns INVALID_ARGUMENT for a signal that
// cannot be caught, RESOURCE_EXHAUSTED. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t
pcp_loop_signal_watch(pcp_loop_t* loop, int signum, pcp_loop_signal_fn_t fn,
                      void* user_data, pcp_loop_signal_t** out_signal);

// Stops watching; |fn| is not called after this returns and |watch| is
// freed (a watch has no final callback). Loop thread only.
void pcp_loop_signal_release(pcp_loop_signal_t* watch);

//===----------------------------------------------------------------------===//
// Child processes
//===----------------------------------------------------------------------===//

typedef struct pcp_loop_process_t pcp_loop_process_t;

typedef enum pcp_loop_stdio_e {
  PCP_LOOP_STDIO_INHERIT = 0,  // the child writes to our fd
  PCP_LOOP_STDIO_IGNORE = 1,   // /dev/null
  PCP_LOOP_STDIO_PIPE = 2,     // delivered to output_fn
} pcp_loop_stdio_t;

// Piped output: |stream_fd| is 1 or 2; |byte_length| 0 means that stream
// reached EOF. |data| is borrowed for the call.
typedef void (*pcp_loop_process_output_fn_t)(void* user_data,
                                             pcp_loop_process_t* process,
                                             int stream_fd, const void* data,
                                             size_t byte_length);

// The final callback of a process. |code| is OK when the child exited (then
// |exit_status| is its exit code, or 0 with |term_signal| set when a signal
// killed it) and CANCELLED when the loop was released first (the child is
// left running; the caller was expected to kill and wait for it). Runs only
// after the child exited AND every piped stream reached EOF, so all output
// is delivered before it (a grandchild that keeps a pipe open delays it).
typedef void (*pcp_loop_process_exit_fn_t)(void* user_data,
                                           pcp_loop_process_t* process,
                                           pcp_status_code_t code,
                                           int64_t exit_status,
                                           int term_signal);

typedef struct pcp_loop_process_options_t {
  const char* file;         // executable; a name without '/' uses PATH
  const char* const* args;  // argv, NULL-terminated, args[0] included
  // "KEY=VALUE" entries, NULL-terminated; NULL inherits our environment.
  const char* const* env;
  const char* cwd;  // NULL: ours
  // stdin is always /dev/null: children of the node manager are daemons.
  pcp_loop_stdio_t stdout_mode;
  pcp_loop_stdio_t stderr_mode;
  // The child leads its own session and process group (setsid): a
  // terminal's Ctrl-C reaches only the supervisor, which decides, and
  // pcp_loop_process_kill signals the whole group, grandchildren included.
  bool new_process_group;
  pcp_loop_process_output_fn_t output_fn;  // required if any stream is PIPE
  pcp_loop_process_exit_fn_t exit_fn;      // required
  void* user_data;
} pcp_loop_process_options_t;

// Spawns a child (uv_spawn: fork + exec, with exec failure reported here,
// not as an exit). Returns NOT_FOUND / PERMISSION_DENIED when the file
// cannot be executed, INVALID_ARGUMENT for missing fields,
// RESOURCE_EXHAUSTED; on error exit_fn never runs. |*out_process| is valid
// until exit_fn has returned. Nothing in |options| is used after this
// returns (the exec has happened by then). Loop thread only (the node manager
// spawns only from its loop thread: libuv's rule).
PCP_MUST_USE_RESULT pcp_status_t pcp_loop_process_spawn(
    pcp_loop_t* loop, const pcp_loop_process_options_t* options,
    pcp_loop_process_t** out_process);

// The child's pid. Loop thread only.
int64_t pcp_loop_process_pid(pcp_loop_process_t* process);

// Sends |signum| to the child, or to its whole process group when spawned
// with |new_process_group|. Returns FAILED_PRECONDITION once the child has
// exited (the pid may already belong to someone else); a group can still be
// signalled until exit_fn has run (a group id is not reused while the group
// has members: the way to end a grandchild that holds a pipe open). Other
// errors are kill(2)'s (NOT_FOUND: no such group). Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t
pcp_loop_process_kill(pcp_loop_process_t* process, int signum);

//===----------------------------------------------------------------------===//
// TCP
//===----------------------------------------------------------------------===//

typedef struct pcp_tcp_listener_t pcp_tcp_listener_t;
typedef struct pcp_tcp_conn_t pcp_tcp_conn_t;

// Most buffers one write may gather (e.g. frame header, JSON part, tensor
// sections).
#define PCP_TCP_MAX_WRITE_BUFFERS 16
// Send queue defaults: writes are refused (RESOURCE_EXHAUSTED) while this
// many bytes are queued, and the writable callback fires at half of it.
#define PCP_TCP_DEFAULT_SEND_HIGH_WATER_BYTES ((size_t)16 << 20)
#define PCP_TCP_DEFAULT_SEND_MAX_WRITES 1024
// Size of the per-loop buffer reads are delivered from.
#define PCP_TCP_READ_BUFFER_BYTES ((size_t)64 << 10)

// Bytes received from the peer. |byte_length| 0 means the peer finished
// sending (EOF, its half-close): no more reads follow, writes still work
// until the caller closes. |data| is borrowed for the call.
typedef void (*pcp_tcp_read_fn_t)(void* user_data, pcp_tcp_conn_t* conn,
                                  const void* data, size_t byte_length);
// The send queue, after having reached the high-water mark (or refused a
// write), drained to half of it.
typedef void (*pcp_tcp_writable_fn_t)(void* user_data, pcp_tcp_conn_t* conn);
// The final callback of a connection, exactly once per started connection
// (a connection closed before pcp_tcp_conn_start has no handler). |status|
// (owned by the callee) is OK after pcp_tcp_conn_close, the I/O error that
// closed the connection (UNAVAILABLE for a reset or broken pipe), or CANCELLED
// when the loop was released.
typedef void (*pcp_tcp_close_fn_t)(void* user_data, pcp_tcp_conn_t* conn,
                                   pcp_status_t status);

typedef struct pcp_tcp_conn_handlers_t {
  pcp_tcp_read_fn_t read;          // required
  pcp_tcp_writable_fn_t writable;  // optional
  pcp_tcp_close_fn_t close;        // optional
  void* user_data;
} pcp_tcp_conn_handlers_t;

// A new connection from a listener; the callee owns it (close it, or start
// it and close it later).
typedef void (*pcp_tcp_accept_fn_t)(void* user_data,
                                    pcp_tcp_listener_t* listener,
                                    pcp_tcp_conn_t* conn);

// Connect result, exactly once. On OK |conn| is connected and owned by the
// callee (start it). On failure |conn| is NULL and |status| (owned by the
// callee) is UNAVAILABLE (refused, unreachable), DEADLINE_EXCEEDED (the
// timeout passed), NOT_FOUND (name did not resolve) or CANCELLED (loop
// released).
typedef void (*pcp_tcp_connect_fn_t)(void* user_data, pcp_tcp_conn_t* conn,
                                     pcp_status_t status);

// Completion of a write or shutdown; |status| owned by the callee. For a
// write, OK means libuv handed every byte to the kernel; the caller's
// buffers may be reused or freed from this callback on.
typedef void (*pcp_tcp_write_fn_t)(void* user_data, pcp_tcp_conn_t* conn,
                                   pcp_status_t status);

// Listens on |address| (IP literal or "localhost"; port 0 picks an ephemeral
// port, see pcp_tcp_listener_port). |backlog| 0 means 511. Each accepted
// connection is handed to |accept_fn| with TCP_NODELAY on; a connection
// that arrives when its handle cannot be allocated is closed at once and
// logged (the listener keeps serving). Returns
// ALREADY_EXISTS (address in use), INVALID_ARGUMENT (not a literal),
// PERMISSION_DENIED, RESOURCE_EXHAUSTED. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t
pcp_tcp_listen(pcp_loop_t* loop, const pcp_net_address_t* address,
               int32_t backlog, pcp_tcp_accept_fn_t accept_fn, void* user_data,
               pcp_tcp_listener_t** out_listener);

// The bound port (the ephemeral one when listening on port 0).
// Loop thread only.
uint16_t pcp_tcp_listener_port(pcp_tcp_listener_t* listener);

// Stops accepting and frees |listener| (no callback after this returns;
// accepted connections are not affected). Loop thread only.
void pcp_tcp_listener_close(pcp_tcp_listener_t* listener);

// Connects to |address| (an IP literal, or a name resolved on libuv's
// thread pool), failing with DEADLINE_EXCEEDED after |timeout_ms| (0: no
// timeout beyond the kernel's). The connection has TCP_NODELAY on. Returns
// INVALID_ARGUMENT (port 0), RESOURCE_EXHAUSTED; on error |connect_fn| never
// runs. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_tcp_connect(
    pcp_loop_t* loop, const pcp_net_address_t* address, uint64_t timeout_ms,
    pcp_tcp_connect_fn_t connect_fn, void* user_data);

// Sets the handlers and starts reading. Call once per connection, before or
// after writing. Returns INVALID_ARGUMENT without a read handler,
// FAILED_PRECONDITION when already started or closing. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_tcp_conn_start(
    pcp_tcp_conn_t* conn, const pcp_tcp_conn_handlers_t* handlers);

// Stops and resumes delivering reads (receive-side backpressure: the kernel
// buffer fills and the peer's writes block). Loop thread only.
void pcp_tcp_conn_read_pause(pcp_tcp_conn_t* conn);
PCP_MUST_USE_RESULT pcp_status_t pcp_tcp_conn_read_resume(pcp_tcp_conn_t* conn);

// Send queue bounds (defaults above). Loop thread only.
void pcp_tcp_conn_set_send_limits(pcp_tcp_conn_t* conn, size_t high_water_bytes,
                                  size_t max_writes);

typedef struct pcp_tcp_buffer_t {
  const void* data;
  size_t byte_length;
} pcp_tcp_buffer_t;

// Writes |buffers| in order, without copying them: they stay borrowed until
// |write_fn| runs (exactly once: OK, the I/O error, the error that closed
// the connection, or CANCELLED when it was closed locally or by loop
// release first). Writes complete in submission order. Returns
// RESOURCE_EXHAUSTED when the send queue already holds high_water_bytes or
// max_writes requests (the writable handler fires once it drains; a single
// write larger than the mark is accepted into an empty-enough queue, so a
// 256 MiB tensor needs no splitting), INVALID_ARGUMENT for 0 or more than
// PCP_TCP_MAX_WRITE_BUFFERS buffers, FAILED_PRECONDITION after shutdown or
// close; on error |write_fn| never runs. |write_fn| may be NULL (then
// nothing tells the caller when the buffers are free: only for static
// data). Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_tcp_conn_write(
    pcp_tcp_conn_t* conn, const pcp_tcp_buffer_t* buffers, size_t buffer_count,
    pcp_tcp_write_fn_t write_fn, void* user_data);

// Bytes queued by accepted writes whose callbacks have not run yet.
// Loop thread only.
size_t pcp_tcp_conn_send_queue_byte_length(pcp_tcp_conn_t* conn);

// Half-close: after every queued write, sends FIN; reading continues.
// |fn| (may be NULL) runs exactly once. Returns FAILED_PRECONDITION when
// already shut down or closing. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_tcp_conn_shutdown(pcp_tcp_conn_t* conn,
                                                       pcp_tcp_write_fn_t fn,
                                                       void* user_data);

// Closes the connection: queued writes complete with CANCELLED, then the
// close handler runs once with OK (or with the error that already started
// closing it). Idempotent until the close handler has run; after that
// |conn| is freed. Loop thread only.
void pcp_tcp_conn_close(pcp_tcp_conn_t* conn);

// Socket options. Return the setsockopt error. Loop thread only.
PCP_MUST_USE_RESULT pcp_status_t pcp_tcp_conn_set_nodelay(pcp_tcp_conn_t* conn,
                                                          bool enable);
// |idle_s|: seconds of silence before the first probe (ignored when off).
PCP_MUST_USE_RESULT pcp_status_t
pcp_tcp_conn_set_keepalive(pcp_tcp_conn_t* conn, bool enable, uint32_t idle_s);

// Counters for metrics: bytes delivered to read handlers and bytes of
// completed writes. Loop thread only.
typedef struct pcp_tcp_conn_stats_t {
  uint64_t bytes_in;
  uint64_t bytes_out;
} pcp_tcp_conn_stats_t;
void pcp_tcp_conn_stats(pcp_tcp_conn_t* conn, pcp_tcp_conn_stats_t* out_stats);

// "127.0.0.1:5000" or "[::1]:5000", taken when the connection was made
// (stays readable while closing). Borrowed, valid until the close handler
// returns. Loop thread only.
const char* pcp_tcp_conn_peer_address(pcp_tcp_conn_t* conn);

// The loop the connection belongs to. Loop thread only.
pcp_loop_t* pcp_tcp_conn_loop(pcp_tcp_conn_t* conn);

#ifdef __cplusplus
}
#endif

#endif  // PCP_NET_NET_H_
