#!/usr/bin/env python3
"""Builds RoCEv2 RC SEND ONLY requests with scapy (scapy.contrib.roce), each in an IPv4
header with a random identification and DF, and prints, one per line, the hex of what
follows the UDP header (BTH, payload, pad, the ICRC scapy computed) and the identification.

Usage: scapy_build.py SRC_IP SRC_PORT DST_IP DST_PORT DEST_QP FIRST_PSN COUNT"""
import random
import sys

from scapy.all import IP, UDP, Raw, raw, bind_layers
from scapy.contrib.roce import BTH

src, sport, dst, dport, dqp, psn, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
bind_layers(UDP, BTH, dport=dport)
rng = random.Random(7)
for i in range(n):
    ident = rng.randrange(1, 65536)
    payload = bytes([i + 1]) * 32
    pkt = IP(src=src, dst=dst, id=ident, flags="DF") / UDP(sport=sport, dport=dport) / \
        BTH(opcode=4, dqpn=dqp, psn=(psn + i) & 0xFFFFFF, ackreq=1) / Raw(payload)
    pkt = IP(raw(pkt))  # built: lengths, checksums and the ICRC filled in
    print(raw(pkt[UDP].payload).hex(), ident)
