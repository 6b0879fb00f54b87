(* Growable vectors over a ring, with the usual numeric kernels. *)

module Make (E : Elt.S) = struct
  type t = { mutable data : E.t array; mutable len : int }

  let create () = { data = [||]; len = 0 }
  let length v = v.len

  let get v i = if i < 0 || i >= v.len then invalid_arg "Vec.get" else Array.unsafe_get v.data i
  let set v i x = if i < 0 || i >= v.len then invalid_arg "Vec.set" else Array.unsafe_set v.data i x

  let push v x =
    if v.len = Array.length v.data then begin
      let data = Array.make (max 8 (2 * v.len)) E.zero in
      Array.blit v.data 0 data 0 v.len;
      v.data <- data
    end;
    Array.unsafe_set v.data v.len x;
    v.len <- v.len + 1

  let init n f = let v = create () in for i = 0 to n - 1 do push v (f i) done; v
  let fold f acc v = let r = ref acc in for i = 0 to v.len - 1 do r := f !r (get v i) done; !r
  let map f v = init v.len (fun i -> f (get v i))
  let map2 f a b = init (min a.len b.len) (fun i -> f (get a i) (get b i))
  let sum v = fold E.add E.zero v
  let dot a b = sum (map2 E.mul a b)
  let scale k v = map (E.mul k) v
  let axpy a x y = map2 (fun xi yi -> E.add (E.mul a xi) yi) x y

  (* coefficients low degree first *)
  let horner v x =
    let r = ref E.zero in
    for i = v.len - 1 downto 0 do r := E.add (E.mul !r x) (get v i) done;
    !r

  let convolve a b =
    if a.len = 0 || b.len = 0 then create ()
    else begin
      let c = init (a.len + b.len - 1) (fun _ -> E.zero) in
      for i = 0 to a.len - 1 do
        let ai = get a i in
        for j = 0 to b.len - 1 do set c (i + j) (E.add (get c (i + j)) (E.mul ai (get b j))) done
      done;
      c
    end

  (* one sweep of the (1, 2, 1) stencil with fixed ends *)
  let smooth v =
    let two = E.of_int 2 in
    init v.len (fun i ->
        if i = 0 || i = v.len - 1 then get v i
        else E.add (E.add (get v (i - 1)) (E.mul two (get v i))) (get v (i + 1)))
end
