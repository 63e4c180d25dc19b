// SPDX-License-Identifier: Apache-2.0
//
// Address parsing and reconnect backoff: pure functions, no loop.

#include <arpa/inet.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "net/net.h"

//===----------------------------------------------------------------------===//
// Addresses
//===----------------------------------------------------------------------===//

static pcp_status_t bad_address(pcp_string_view_t text, const char* why) {
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "bad address '%.*s': %s (want host:port or "
                         "[ipv6]:port)",
                         (int)(text.size > 300 ? 300 : text.size), text.data,
                         why);
}

// Strict decimal: 1-5 digits, no sign, no spaces, <= 65535. Leading zeros
// are accepted ("080" is 80), as every other tool does.
static bool parse_port(pcp_string_view_t text, uint16_t* out_port) {
  if (text.size == 0 || text.size > 5) {
    return false;
  }
  uint32_t value = 0;
  for (size_t i = 0; i < text.size; ++i) {
    char c = text.data[i];
    if (c < '0' || c > '9') {
      return false;
    }
    value = value * 10 + (uint32_t)(c - '0');
  }
  if (value > 65535) {
    return false;
  }
  *out_port = (uint16_t)value;
  return true;
}

// IPv6 literal, optionally with a "%zone" suffix (link-local addresses).
static bool is_ipv6_literal(const char* host) {
  char copy[PCP_NET_MAX_HOST_LENGTH + 1];
  size_t length = strnlen(host, sizeof(copy));
  if (length == 0 || length >= sizeof(copy)) {
    return false;
  }
  memcpy(copy, host, length + 1);
  char* zone = strchr(copy, '%');
  if (zone) {
    if (zone[1] == '\0') {
      return false;
    }
    *zone = '\0';
  }
  unsigned char scratch[16];
  return inet_pton(AF_INET6, copy, scratch) == 1;
}

bool pcp_net_host_is_literal(const char* host) {
  unsigned char scratch[16];
  if (inet_pton(AF_INET, host, scratch) == 1) {
    return true;
  }
  return is_ipv6_literal(host);
}

pcp_status_t pcp_net_address_parse(pcp_string_view_t text,
                                   pcp_net_address_t* out_address) {
  memset(out_address, 0, sizeof(*out_address));
  if (text.size == 0) {
    return bad_address(text, "empty");
  }
  pcp_string_view_t host;
  pcp_string_view_t port;
  bool bracketed = text.data[0] == '[';
  if (bracketed) {
    const char* close = memchr(text.data, ']', text.size);
    if (!close) {
      return bad_address(text, "'[' without ']'");
    }
    host = pcp_make_string_view(text.data + 1, (size_t)(close - text.data - 1));
    size_t rest = text.size - (size_t)(close - text.data) - 1;
    if (rest == 0 || close[1] != ':') {
      return bad_address(text, "missing ':port' after ']'");
    }
    port = pcp_make_string_view(close + 2, rest - 1);
  } else {
    const char* colon = NULL;
    for (size_t i = text.size; i > 0; --i) {
      if (text.data[i - 1] == ':') {
        colon = text.data + i - 1;
        break;
      }
    }
    if (!colon) {
      return bad_address(text, "missing ':port'");
    }
    host = pcp_make_string_view(text.data, (size_t)(colon - text.data));
    port = pcp_make_string_view(colon + 1,
                                text.size - (size_t)(colon - text.data) - 1);
    if (memchr(host.data, ':', host.size) ||
        memchr(host.data, ']', host.size)) {
      return bad_address(text, "an IPv6 literal must be in brackets");
    }
  }
  if (host.size == 0) {
    return bad_address(text, "empty host");
  }
  if (host.size > PCP_NET_MAX_HOST_LENGTH) {
    return bad_address(text, "host longer than 255 bytes");
  }
  for (size_t i = 0; i < host.size; ++i) {
    unsigned char c = (unsigned char)host.data[i];
    if (c <= ' ' || c >= 0x7F || c == '[' || c == '/') {
      return bad_address(text, "bad character in host");
    }
  }
  if (!parse_port(port, &out_address->port)) {
    return bad_address(text, "port must be a decimal in [0, 65535]");
  }
  memcpy(out_address->host, host.data, host.size);
  out_address->host[host.size] = '\0';
  if (bracketed && !is_ipv6_literal(out_address->host)) {
    memset(out_address, 0, sizeof(*out_address));
    return bad_address(text, "brackets hold no IPv6 literal");
  }
  return pcp_ok_status();
}

size_t pcp_net_address_format(const pcp_net_address_t* address, char* buffer,
                              size_t capacity) {
  bool ipv6 = strchr(address->host, ':') != NULL;
  int length = snprintf(buffer, capacity, ipv6 ? "[%s]:%u" : "%s:%u",
                        address->host, (unsigned)address->port);
  return length < 0 ? 0 : (size_t)length;
}

//===----------------------------------------------------------------------===//
// Backoff
//===----------------------------------------------------------------------===//

pcp_backoff_options_t pcp_backoff_options_default(void) {
  pcp_backoff_options_t options = {
      .min_ms = 100, .max_ms = 30000, .multiplier = 2.0};
  return options;
}

pcp_status_t pcp_backoff_initialize(const pcp_backoff_options_t* options,
                                    pcp_backoff_t* out_backoff) {
  memset(out_backoff, 0, sizeof(*out_backoff));
  if (options->min_ms < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "backoff min_ms %lld is negative",
                           (long long)options->min_ms);
  }
  if (options->max_ms < options->min_ms) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "backoff max_ms %lld is below min_ms %lld",
        (long long)options->max_ms, (long long)options->min_ms);
  }
  if (!isfinite(options->multiplier) || options->multiplier < 1.0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "backoff multiplier %g must be finite and >= 1",
                           options->multiplier);
  }
  out_backoff->options = *options;
  pcp_backoff_reset(out_backoff);
  return pcp_ok_status();
}

void pcp_backoff_reset(pcp_backoff_t* backoff) {
  backoff->attempt = 0;
  // A zero minimum would keep the ceiling at zero forever; growth starts
  // from 1 ms instead.
  int64_t start = backoff->options.min_ms > 0 ? backoff->options.min_ms : 1;
  if (start > backoff->options.max_ms) {
    start = backoff->options.max_ms;
  }
  backoff->ceiling_ms = (double)start;
}

int64_t pcp_backoff_next_ms(pcp_backoff_t* backoff, pcp_rng_t* rng) {
  const pcp_backoff_options_t* options = &backoff->options;
  int64_t ceiling = (int64_t)backoff->ceiling_ms;
  if (ceiling > options->max_ms) {
    ceiling = options->max_ms;
  }
  if (ceiling < options->min_ms) {
    ceiling = options->min_ms;
  }
  // Always one draw, even when the span is empty, so the number of values
  // taken from |rng| does not depend on the options (replays stay aligned).
  uint64_t span = (uint64_t)(ceiling - options->min_ms);
  int64_t delay = options->min_ms + (int64_t)pcp_rng_next_below(rng, span + 1);
  // The ceiling grows in floating point and is clamped, so a long outage
  // never overflows however many attempts pile up.
  double next = backoff->ceiling_ms * options->multiplier;
  backoff->ceiling_ms =
      next > (double)options->max_ms ? (double)options->max_ms : next;
  if (backoff->attempt < UINT32_MAX) {
    ++backoff->attempt;
  }
  return delay;
}
