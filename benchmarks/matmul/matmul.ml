(* Square matrices over a ring, flat row-major arrays, and several product loop orders.
   Every order adds the products for an entry in increasing k, so all give identical
   results even for floats. *)

module Make (R : Ring.S) = struct
  type m = { n : int; a : R.t array }

  let init n f = { n; a = Array.init (n * n) (fun k -> f (k / n) (k mod n)) }
  let get m i j = Array.unsafe_get m.a ((i * m.n) + j)
  let set m i j v = Array.unsafe_set m.a ((i * m.n) + j) v
  let acc m i j v = set m i j (R.add (get m i j) v)
  let zeros n = { n; a = Array.make (n * n) R.zero }

  let ijk x y =
    let n = x.n in
    let c = zeros n in
    for i = 0 to n - 1 do
      for j = 0 to n - 1 do
        let s = ref R.zero in
        for k = 0 to n - 1 do s := R.add !s (R.mul (get x i k) (get y k j)) done;
        set c i j !s
      done
    done;
    c

  let ikj x y =
    let n = x.n in
    let c = zeros n in
    for i = 0 to n - 1 do
      for k = 0 to n - 1 do
        let xik = get x i k in
        for j = 0 to n - 1 do acc c i j (R.mul xik (get y k j)) done
      done
    done;
    c

  let kij x y =
    let n = x.n in
    let c = zeros n in
    for k = 0 to n - 1 do
      for i = 0 to n - 1 do
        let xik = get x i k in
        for j = 0 to n - 1 do acc c i j (R.mul xik (get y k j)) done
      done
    done;
    c

  let blocked ?(tile = 32) x y =
    let n = x.n in
    let c = zeros n in
    let rec tiles lo f = if lo < n then (f lo (min n (lo + tile)); tiles (lo + tile) f) in
    tiles 0 (fun k0 k1 ->
        tiles 0 (fun i0 i1 ->
            tiles 0 (fun j0 j1 ->
                for i = i0 to i1 - 1 do
                  for k = k0 to k1 - 1 do
                    let xik = get x i k in
                    for j = j0 to j1 - 1 do acc c i j (R.mul xik (get y k j)) done
                  done
                done)));
    c

  let checksum m = Array.fold_left (fun h v -> ((h * 31) + R.checksum v) land 0x3fffffff) 17 m.a
  let equal p q = p.n = q.n && Array.for_all2 (fun u v -> R.checksum u = R.checksum v) p.a q.a
end
