#!/usr/bin/env python3
"""Checks the ICRC of every RoCEv2 packet in a pcap capture with scapy's own ICRC code
(scapy.contrib.roce), over the IPv4 header each packet carries (identification included).

Usage: scapy_icrc.py CAPTURE [UDP_PORT ...]
Packets to or from the ports given, and to port 4791, are RoCEv2; with no port given,
every UDP datagram in the capture is. Prints "checked N bad M ipv6 K" and, for each bad
packet, its index and both ICRCs. IPv6 packets are counted but not checked (scapy
computes the ICRC over IPv4 only)."""
import sys

from scapy.all import IP, IPv6, UDP, rdpcap, raw, bind_layers
from scapy.contrib.roce import BTH

path, ports = sys.argv[1], {int(p) for p in sys.argv[2:]}
pkts = rdpcap(path)
if not ports:
    ports = {p[UDP].dport for p in pkts if UDP in p} | {p[UDP].sport for p in pkts if UDP in p}
for p in ports:
    bind_layers(UDP, BTH, dport=p)
    bind_layers(UDP, BTH, sport=p)
checked = bad = v6 = 0
for i, pkt in enumerate(pkts):
    pkt = pkt.__class__(raw(pkt))  # dissected again, with the bindings
    if BTH not in pkt:
        continue
    if IPv6 in pkt:
        v6 += 1
        continue
    want = pkt[BTH].compute_icrc(None)
    got = raw(pkt[UDP].payload)[-4:]
    checked += 1
    if want != got:
        bad += 1
        print("bad", i, got.hex(), want.hex(), "id", pkt[IP].id)
print("checked", checked, "bad", bad, "ipv6", v6)
