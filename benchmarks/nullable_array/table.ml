(* Work over any nullable array: an open-addressing hash map with linear probing and
   backward-shift deletion, and a sparse-vector kernel. *)

module Map (K : Nullable.S with type elt = int) (V : Nullable.S) = struct
  type t = { keys : K.t; vals : V.t; mutable size : int }

  let create cap = { keys = K.make cap; vals = V.make cap; size = 0 }
  let cap m = K.length m.keys
  let home m k = (k * 0x2545F491) land max_int mod cap m
  let next m i = if i + 1 = cap m then 0 else i + 1

  (* the slot holding [k], or the empty slot where it would go *)
  let rec probe m k i = if K.is_null m.keys i || K.get_or m.keys i ~default:0 = k then i else probe m k (next m i)

  let find m k = let i = probe m k (home m k) in V.get m.vals i

  let replace m k v =
    let i = probe m k (home m k) in
    if K.is_null m.keys i then begin
      if 2 * (m.size + 1) > cap m then failwith "Map.replace: full";
      K.set m.keys i k;
      m.size <- m.size + 1
    end;
    V.set m.vals i v

  (* is slot [j] on the probe path from [h] to [i] (cyclically, exclusive of i)? *)
  let between h j i = if h <= i then h <= j && j < i else h <= j || j < i

  let remove m k =
    let i = probe m k (home m k) in
    if not (K.is_null m.keys i) then begin
      m.size <- m.size - 1;
      (* shift back later entries whose probe path crosses the hole *)
      let rec fill hole j =
        if K.is_null m.keys j then (K.clear m.keys hole; V.clear m.vals hole)
        else begin
          let kj = K.get_or m.keys j ~default:0 in
          (* kj may move into the hole only if the hole lies on its probe path *)
          if not (between (home m kj) hole j) then fill hole (next m j)
          else begin
            K.set m.keys hole kj;
            (match V.get m.vals j with Some v -> V.set m.vals hole v | None -> V.clear m.vals hole);
            fill j (next m j)
          end
        end
      in
      fill i (next m i)
    end

  let fold f acc m = K.fold (fun acc i k -> match V.get m.vals i with Some v -> f acc k v | None -> acc) acc m.keys
end

module Sparse (F : Nullable.S with type elt = float) = struct
  let of_fn n f = let a = F.make n in for i = 0 to n - 1 do match f i with Some x -> F.set a i x | None -> () done; a

  let dot a b =
    F.fold (fun s i x -> if F.is_null b i then s else s +. (x *. F.get_or b i ~default:0.)) 0. a

  let count a = F.fold (fun n _ _ -> n + 1) 0 a
end
