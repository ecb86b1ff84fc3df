#!/bin/sh
# proxy-operator: squid's logfile daemon for the access_log line that logs
# %<Hs, the status of each answer squid received from a target site (the
# rendered squid.conf says logfile_daemon and that line). It counts them by
# class and serves the totals as "upstream.<class> = <n>" lines on
# 127.0.0.1:<port>, the port being the end of its argument (the log's
# "path", daemon:/127.0.0.1:<port>). squid reaches it for the operator's
# credential only (squid.conf's upstream_counts rule).
#
# squid writes one command per line on stdin: "L<entry>" logs an entry, the
# others (R rotate, T truncate, O reopen, F flush, r, b) concern files and
# are ignored. End of stdin: squid stopped or reconfigured, and starts a
# new daemon, whose counts begin at zero.
#
# A shell preamble starts the perl program below (perl -x): squid stops
# when its logfile daemon cannot run, and a kubernetes squid image is the
# user's choice, which may lack perl. Without it the daemon says so on
# squid's stderr and only reads what squid writes: squid keeps serving,
# and the counts stay unknown (nothing listens on the port).
if perl -e 'use IO::Select; use IO::Socket::INET;' 2>/dev/null; then
	exec perl -x "$0" "$@"
fi
echo "upstream-counter: this image has no perl (perl-base) on PATH: the target sites' answers are not counted" >&2
while read -r _; do :; done
exit 0

#!/usr/bin/perl
use strict;
use warnings;
use IO::Select;
use IO::Socket::INET;

my ($port) = ($ARGV[0] // '') =~ /:(\d+)$/;
die "upstream-counter: no port at the end of '" . ($ARGV[0] // '') . "'\n" unless $port;

# 403 and 429 are also in 4xx: the usual ban signals, counted apart.
my @classes = qw(2xx 3xx 4xx 5xx 403 429);
my %count = map { $_ => 0 } @classes;
my ($listener, $pending) = (undef, '');

# A port still held (by the daemon this one replaces) is retried each
# second; stdin is read meanwhile, so squid never waits on this daemon.
sub listen_once {
    $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
        Proto => 'tcp', Listen => 8, ReuseAddr => 1);
}

sub count_entry {
    my ($status) = @_;
    return unless $status =~ /^([2-5])\d\d$/;    # "-": no answer (a tunnel, a refusal)
    $count{"$1xx"}++;
    $count{$status}++ if $status eq '403' || $status eq '429';
}

# Answers one reader after its request (read for up to a second, so that
# closing never resets a connection with unread data).
sub answer {
    my ($conn) = @_;
    my ($request, $ready) = ('', IO::Select->new($conn));
    while ($request !~ /\r?\n\r?\n/ && length($request) < 8192 && $ready->can_read(1)) {
        last unless sysread($conn, $request, 4096, length $request);
    }
    my $body = join '', map { "upstream.$_ = $count{$_}\n" } @classes;
    print $conn "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: no-store\r\n"
        . "Content-Length: " . length($body) . "\r\nConnection: close\r\n\r\n" . $body;
    close $conn;
}

listen_once();
while (1) {
    my $select = IO::Select->new(\*STDIN);
    $select->add($listener) if $listener;
    for my $fh ($select->can_read($listener ? undef : 1)) {
        if ($listener && $fh == $listener) {
            my $conn = $listener->accept or next;
            answer($conn);
            next;
        }
        my $n = sysread(STDIN, my $chunk, 65536);
        exit 0 unless $n;
        $pending .= $chunk;
        while ($pending =~ s/^([^\n]*)\n//) {
            my $line = $1;
            count_entry($1) if $line =~ /^L(\S*)/;
        }
    }
    listen_once() unless $listener;
}
