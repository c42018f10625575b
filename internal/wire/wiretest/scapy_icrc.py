#!/usr/bin/env python3
"""Checks the ICRC of every RoCEv2 packet in a pcap capture with scapy's own ICRC code
(scapy.contrib.roce), over the IPv4 header each packet carries (identification included).

Usage: scapy_icrc.py CAPTURE [UDP_PORT ...]   (port 4791 is always RoCEv2)
Prints "checked N bad M ipv6 K" and, for each bad packet, its index and both ICRCs.
IPv6 packets are counted but not checked (scapy computes the ICRC over IPv4 only)."""
import sys

from scapy.all import IP, IPv6, UDP, rdpcap, raw, bind_layers
from scapy.contrib.roce import BTH

path, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
for p in ports:
    bind_layers(UDP, BTH, dport=p)
    bind_layers(UDP, BTH, sport=p)
checked = bad = v6 = 0
for i, pkt in enumerate(rdpcap(path)):
    if BTH not in pkt:
        continue
    if IPv6 in pkt:
        v6 += 1
        continue
    bth = pkt[BTH]
    want = bth.compute_icrc(None)
    got = raw(pkt[UDP].payload)[-4:]
    checked += 1
    if want != got:
        bad += 1
        print("bad", i, got.hex(), want.hex(), "id", pkt[IP].id)
print("checked", checked, "bad", bad, "ipv6", v6)
